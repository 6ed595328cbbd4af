"""The shell's runtime: the pieces commands, tools and tests compose (child processes, in-process wiring)."""
