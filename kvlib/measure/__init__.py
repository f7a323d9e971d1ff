"""Measuring on the reader's hardware (chapter 0, and every chapter that times something).

- ``timing``: the one timer (:func:`time_it`: warm-up, repeats, median and fastest; CUDA
  synchronised), interleaved rounds for fair comparisons, the wall and thread clocks, and
  thread control.
- ``hardware``: what the machine has, read rather than assumed: cache sizes (and the
  ``KVBOOK_LLC_BYTES`` override), cores, memory, the DRAM-sized buffer of a probe, and the
  hardware banner every measuring chapter starts with.
- ``probes``: what the machine can do: DRAM bandwidth, matmul FLOP/s and kernel-launch
  overhead, at one thread and at all threads.
"""
