"""Feedback from outside (issue 21): the versioned feedback-reward configuration and the pure
watermark join that turns rollouts and feedback events into feedback rewards, late and unmatched records."""
