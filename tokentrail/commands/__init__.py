"""The shell's command modules: each registers its subcommands and passes settings sections down."""
