"""`python -m service` is the `foxhunt` CLI."""

from service.cli import main

if __name__ == "__main__":
    main()
