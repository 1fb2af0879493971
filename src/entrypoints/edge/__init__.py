"""The request pipeline every surface shares, framework-free: the head read once (`head`), the
request checks (`checks`), the body under its limit with 413, drain and linger (`body`), the
request id, latency metric and trace span (`exchange`), the problem answer of any error
(`problems`, `outages`), the security and CORS headers (`browser`), HEAD as GET
(`head_method`). Litestar's middleware and handlers and the append front all call these."""
