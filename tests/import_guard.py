"""The import-boundary tests' guard: source that makes a package unimportable in a `python -c` script."""

from __future__ import annotations

import textwrap


def forbid(package: str, why: str) -> str:
    """Source to run first in a script: importing `package` or a module of it then raises ImportError
    with `why` and the module's name, so a test sees which import crossed the boundary."""
    return textwrap.dedent(
        f"""
        import sys

        class Forbid:
            def find_spec(self, name, path=None, target=None):
                if name == {package!r} or name.startswith({package + "."!r}):
                    raise ImportError(f"{why} (import of {{name}})")
                return None

        sys.meta_path.insert(0, Forbid())
        """
    )


def trainer_cli_without(package: str, why: str) -> str:
    """A `python -c` script that runs the trainer's CLI (its arguments after the script) with `package`
    forbidden: a pipeline step that must not import it fails on the import that crossed."""
    return forbid(package, why) + textwrap.dedent(
        """
        from trainer.cli import main
        sys.argv = ["foxhunt-trainer", *sys.argv[1:]]
        main()
        """
    )
