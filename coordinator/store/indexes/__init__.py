"""Replica memory fed by etcd watches: the ready index ClaimNext reads, the claimed index and the
queue counts, the prefix copy under both, and the watch-then-scan loop the background movers run
on."""
