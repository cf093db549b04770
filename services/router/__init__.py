"""The router: picks nodes for a request from the index's view of caches and load. It decides;
it never carries the request."""
