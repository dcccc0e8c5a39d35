"""Pure numerical kernels: arrays and static ints in, arrays out. No NumPyro objects here."""
