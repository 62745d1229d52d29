"""CER: the conditional expectation reward, the policy's own probability of the reference answer
given its sampled solutions, as a soft verifier for free-form answers."""
