"""``python -m privret``: the same entry point as the ``privret`` command."""

from privret.cli import main

if __name__ == "__main__":
    main()
