"""kerasdist's TensorFlow binding: the collectives as TensorFlow ops, their
gradients, and the collectives on variables and Python objects built on
them."""
