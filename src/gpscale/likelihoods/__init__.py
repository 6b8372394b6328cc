"""gpscale.likelihoods."""
