"""The global cache index: which nodes hold which image embeddings (mm_hash) and KV pages
(block_hash), and which nodes are alive. Used by every node and by the router."""
