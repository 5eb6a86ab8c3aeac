"""`vflsec reproduce`: the seed papers' quantitative claims, one module per paper (luo, rassouli, varasteh,
privee, ye) registering its claims in claims.py's registry; run.py measures them and writes the results."""
