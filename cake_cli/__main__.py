"""`python -m cake_cli` entry point."""

from cake_cli.cli.main import main

if __name__ == "__main__":
    main()
