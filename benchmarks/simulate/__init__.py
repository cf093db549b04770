"""The cluster simulator behind ``tessera bench --suite simulate``: the real router and the real
index, with each role's compute modelled on a virtual clock.

  workload.py       multi-turn sessions about Zipf-popular images (deterministic)
  cluster.py        modelled nodes: compute queues, bounded LRU caches, their index records
  request_path.py   one request's way through the roles, with failover
  (the llm-d-style baseline is a routing policy: services/router/policies.py, LlmdPolicy)
  events.py         the virtual clock
  metrics.py        what a run counts
  index_stats.py    the index server's own counters
  run.py            one run: a policy on a cluster of N nodes, with churn
  report.py         tables, growth with the node count, the goals
"""
