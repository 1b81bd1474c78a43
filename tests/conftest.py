"""Session-wide test settings."""

import torch

# Tiny CPU forwards are dominated by thread hand-off on small machines (2 cores here):
# one intra-op thread is faster and keeps results reproducible.
torch.set_num_threads(1)
