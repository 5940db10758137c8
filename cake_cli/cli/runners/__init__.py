"""The heavy halves of the commands (they load torch and the model); one module per `cli/commands` module."""
