"""Adapters that feed tokentrail samples into other training libraries' steps, token for token.

Each imports its library lazily, so tokentrail imports without it (``trl_grpo``: Hugging Face TRL's
``GRPOTrainer``, installed apart in ``.venv-trl`` by ``make setup-trl``)."""
