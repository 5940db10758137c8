"""One module per command group; importing a module registers its commands on `cake_cli.cli.app.app`."""
