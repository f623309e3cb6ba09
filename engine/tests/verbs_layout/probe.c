/* Prints the size, alignment, field offsets and constant values that
 * engine/src/verbs/ffi.rs must match, as rdma-core's own header defines them.
 * checks.inc (written by engine/tests/verbs_layout.rs from its table of the
 * Rust definitions) is a list of SIZE(key, type) / OFF(key, type, field) /
 * CONST(name) lines. Output: one "<kind> <key> <value>" line per check. */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#define SIZE(k, t) printf("size %s %zu\nalign %s %zu\n", k, sizeof(t), k, (size_t)__alignof__(t));
#define OFF(k, t, f) printf("offset %s %zu\n", k, offsetof(t, f));
#define CONST(c) printf("const %s %lld\n", #c, (long long)(c));

int main(void)
{
#include "checks.inc"
	return 0;
}
