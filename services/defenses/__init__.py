"""Score and parameter release defenses and the release chains that run them."""
