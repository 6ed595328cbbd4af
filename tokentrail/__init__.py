"""tokentrail: the shell around the stage core — settings, CLI, local services, the demo job."""
