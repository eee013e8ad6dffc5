"""``spark-submit`` entry point for the analytics job: the ``mc0 pipeline`` command, run by Spark.

    spark-submit "$(python -c 'import mc0.cli.submit as s; print(s.__file__)')" [mc0 pipeline options]

The master comes from spark-submit unless ``--master`` is given.  The launcher
lives with the CLI it runs (the app floor); the job itself,
:mod:`mc0.spark.pipeline`, never imports the CLI.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from mc0.cli import main as cli_main  # absolute: spark-submit runs this file as a script

    args = list(sys.argv[1:] if argv is None else argv)
    if "--master" not in args:
        args = ["--master", "submit", *args]
    cli_main(["pipeline", *args])  # exits with the command's status
    return 0


if __name__ == "__main__":
    sys.exit(main())
