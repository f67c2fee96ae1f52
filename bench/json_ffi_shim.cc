// json_ffi_shim.cc — the extern "C" face a C program would need to call
// simdjson (bench/json_ffi.sh): the usage object's two counts through a
// thread's reused On-Demand parser, from a caller's buffer that has
// SIMDJSON_PADDING readable bytes after len. No exception crosses into C.
#include <cstddef>
#include <cstdint>

#include <simdjson.h>

extern "C" size_t sj_padding(void)
{
    return simdjson::SIMDJSON_PADDING;
}

// 0: both counts read (*pt, *ct); -1: not a usage object, or bad JSON.
extern "C" int sj_usage_read(const char *buf, size_t len, size_t cap, long long *pt, long long *ct)
{
    static thread_local simdjson::ondemand::parser p;
    simdjson::ondemand::document doc;
    if (p.iterate(buf, len, cap).get(doc))
        return -1;
    simdjson::ondemand::object o;
    if (doc.get_object().get(o))
        return -1;
    int64_t v;
    if (o["prompt_tokens"].get_int64().get(v))
        return -1;
    *pt = v;
    if (o["completion_tokens"].get_int64().get(v))
        return -1;
    *ct = v;
    return 0;
}
