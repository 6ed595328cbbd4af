"""The test kit: synthetic records, scripted verifiers and stage inputs, an in-process gateway, and topic
read-back, shared by the tests, the benchmarks and the reliability suite (outside the product's packages)."""
