/*
 * main.c — command line: `sluice -c FILE` runs, `sluice -t -c FILE` checks.
 * (placeholder while the gateway is assembled)
 */
#include <stdio.h>

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice: not yet\n");
    return 1;
}
