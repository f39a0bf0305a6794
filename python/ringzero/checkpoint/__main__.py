"""python -m ringzero.checkpoint consolidate CHECKPOINT_ROOT_OR_DIR OUT.pt (ringzero.checkpoint.main)."""
from . import main

raise SystemExit(main())
