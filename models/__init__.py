"""The models layer: the embedded reference model (``models.reference``) and the on-disk policy store
(``models.policy_store``), shared by the engines (producers) and the trainer. Depends on ``schemas`` only."""
