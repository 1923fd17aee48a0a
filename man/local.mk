dist_man_MANS += man/sfi-ref.1 man/sfi-sim.1 man/sfi-trace.5
