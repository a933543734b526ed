"""Subcommands of ``polyml`` beyond build/run: one module each, registered with
:func:`polyml.cli.command`. Every module here is imported when the CLI starts."""
