"""The DLRM workload: Criteo-format data, preprocessing ops and UDFs, the DLRM model and its training loop.

Modules: ``data`` (schema and synthetic generator), ``ops`` (vectorised preprocessing ops),
``pipelines`` (``dlrm_standard`` and ``dlrm_heavy`` UDFs), ``model`` (DLRM), ``train`` (loop, idle
time, AUC), ``demo`` (``intune demo``), and the ``intune data`` commands. Importing this package
imports nothing heavy; import the modules you need.
"""
