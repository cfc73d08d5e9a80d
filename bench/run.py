"""``python bench/run.py [options]``: the same as ``python -m bench`` / ``python -m cgru bench``."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.__main__ import main
sys.exit(main(sys.argv[1:]))
