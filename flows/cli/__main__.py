"""``python -m flows.cli ARGS``: the ``rlfoundry`` program."""

from flows.cli import main

if __name__ == "__main__":
    main()
