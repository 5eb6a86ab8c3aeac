"""vflsec: vertical federated learning with measured privacy.

The package is assembled from three folders of the repository: the generated protocol (``vflsec.v1``,
from ``proto/``), the party services (``vflsec.services``, from ``services/``) and the operator side
(``vflsec.client``, from ``client/``).
"""

__version__ = "0.1.0"
