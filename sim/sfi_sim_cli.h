/* Subcommands of sfi-sim; each lives in its own sim/cmd_*.c and returns the
 * process exit status (0 ok, 1 bad input or failure, 2 usage error). */
#ifndef SFI_SIM_CLI_H
#define SFI_SIM_CLI_H

int sfi_sim_cmd_sweep(int argc, char **argv); /* also the default run */
int sfi_sim_cmd_serve(int argc, char **argv); /* a workload through a serving engine */
int sfi_sim_cmd_trace(int argc, char **argv); /* trace check|info */
int sfi_sim_cmd_analyze(int argc, char **argv);
int sfi_sim_cmd_presets(int argc, char **argv);  /* list GPUs, models, policies */
int sfi_sim_cmd_validate(int argc, char **argv); /* model vs measured kernel times */

#endif
