"""The vocabulary every layer above speaks: exit codes and user errors (`errors`), the result model (`results`), what
a check's outcome is (`outcomes`), schema text (`schema`), which devices can run here (`environment`), atomic file
writes (`files`), which shard of a `--shard K/N` run owns a result (`shard`), how opforge starts, reads and ends a
child process that imports it (`child`) and the messages every such child speaks (`protocol`), and the GPU spin bench
and the stream check wait with (`cuda_spin`)."""
