"""Private plumbing shared by every room: atomic file output, output-path checks, optional
dependencies, progress bars, recognising torch tensors without importing torch, the upstream-quirk
warning, and the table of module paths that moved.  Nothing here imports another fp8sim room."""
