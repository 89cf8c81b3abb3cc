"""Ray groups and actors: the Megatron ranks of the policy and the reference, the vLLM engine actors."""
