/*
 * gw_balance.h — pure server choice (balance.c): smooth weighted
 * round-robin and least-connections, over items the caller fills.
 */
#ifndef GW_BALANCE_H
#define GW_BALANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gw_balance_item {
    int weight;
    int active;    /* least_conn */
    bool eligible; /* not ejected */
    int *current;  /* rr state, per worker */
} gw_balance_item_t;
/* Index of the chosen item, or -1 when none is eligible. */
int gw_balance_pick(gw_balance_item_t *items, size_t n, int balance, uint64_t tiebreak);

#endif
