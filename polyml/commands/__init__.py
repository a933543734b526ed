"""Subcommands of ``polyml`` beyond build/run: one module each, registered with
:func:`polyml.commands._common.command`. Every module here is imported when the CLI starts."""
