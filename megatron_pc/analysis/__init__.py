"""Analysis of runs, for users: the run loader (``runs``), ``megatron-pc report`` (``report``,
its markdown ``report_format`` and PNG ``report_plots``), the named task regimes (``regimes``)
and ``megatron-pc simulate`` (``simulate``). Benchmarks (``benchmarks``) build on these;
nothing here imports a benchmark."""
