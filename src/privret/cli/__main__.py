"""``python -m privret.cli``."""

from privret.cli import main

main()
