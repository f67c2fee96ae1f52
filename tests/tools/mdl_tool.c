/*
 * mdl_tool.c — stand-alone front end of `sluice model ...` for the model
 * tests and benchmarks: `mdl_tool info FILE`, `mdl_tool generate ...`, and
 * the diagnostic subcommands (see mdl_cli_main in model/cli.c).
 */
#include "model/model.h"

int main(int argc, char **argv)
{
    return mdl_cli_main(argc, argv);
}
