"""Public datasets: the catalogue (``registry``), resumable downloads (``download``), readers of
original formats (``planetoid``, ``ogb``), the ``recipes`` that build stores, and ``fetch``."""
