"""ye et al. on real trained active-top split-NNs: ``python benchmarks/measure_ye.py [EXPERIMENT ...]``.

The code lives in the package (vflsec.client.ye_measure), where `vflsec reproduce` runs it from an installed wheel.
"""

from vflsec.client.ye_measure import main

if __name__ == "__main__":
    main()
