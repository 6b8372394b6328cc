"""``python -m gpscale``: the ``gpscale`` command (:mod:`gpscale.cli`), for environments where
the console script is not on the PATH."""

from gpscale.cli.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
