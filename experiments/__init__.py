"""Cross-method experiments, above the method packages: every run on its benchmarks
(``evaluate_all``, its plots), seeded comparisons with paired intervals (``compare``), the tiny
end-to-end demo and its report (``demo``, ``demo_report``). Imports ``common`` and the method
packages (``arco``, ``cer``, ``eviback``); nothing below imports it."""
