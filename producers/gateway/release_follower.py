"""The gateway's view of the release: ``schemas.kafka.release_follower.ReleaseFollower`` (in the contract, as the
trainer follows the same decisions and neither component may import the other)."""

from schemas.kafka.release_follower import ReleaseFollower

__all__ = ["ReleaseFollower"]
