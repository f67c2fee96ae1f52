// json_parse_simdjson.cc — bench/json_parse.c's count for simdjson (Debian's
// libsimdjson-dev 3.0.1, C++), run by json_parse.sh when installed. Every
// parse first copies the input into a reused buffer with SIMDJSON_PADDING
// bytes after it (sluice's body is not padded: the copy is in the figure).
//
//   dom      one dom::parser, reused; parse (grammar, numbers, strings and
//            UTF-8 all checked by the parse itself), then a walk of the tape
//            that touches every value (the work the other readers do).
//   od       one ondemand::parser, reused; reads what gateway/body_scan.c
//            reads (model, stream, stream_options.include_usage, the
//            max_*tokens, n, tools' kind; messages[]: role, content as a
//            string or parts with type, text, image_url, name, tool_calls'
//            kind) and walks every other value to its end (numbers parsed,
//            strings unescaped, literals checked), then checks nothing
//            trails the document. usage: reads prompt_tokens and
//            completion_tokens as gw_llm_usage_bytes does, walks the rest.
//   od-skip  the same reads, everything else skipped (On-Demand's own
//            behaviour: a skipped value's brackets are counted, nothing
//            inside it is checked) and no trailing-content check.
//   info     the kernels: active (picked at run time), builtin (chosen at
//            compile time: On-Demand's stage 2 is compiled into the caller).
//   check    malformed inputs through dom, od and od-skip: which are refused.
//
//   json_parse_simdjson MODE FILE N [usage]     (usage: FILE is a usage object)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <simdjson.h>

namespace
{

using simdjson::error_code;
using simdjson::SUCCESS;
namespace od = simdjson::ondemand;

unsigned long events;

#define SJ_STR2(x) #x
#define SJ_STR(x)  SJ_STR2(x)

// ---- input -------------------------------------------------------------------

std::string slurp(const char *path)
{
    std::string s;
    FILE *f = std::fopen(path, "rb");
    if (!f)
        return s;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0)
        s.append(buf, n);
    std::fclose(f);
    return s;
}

// The copy sluice would make: body into a buffer SIMDJSON_PADDING longer.
struct padbuf {
    std::vector<char> b;
    size_t len = 0;
    void fill(const std::string &src)
    {
        if (b.size() < src.size() + simdjson::SIMDJSON_PADDING)
            b.resize(src.size() + simdjson::SIMDJSON_PADDING);
        std::memcpy(b.data(), src.data(), src.size());
        len = src.size();
    }
};

// ---- dom ---------------------------------------------------------------------

void dom_walk(simdjson::dom::element e)
{
    events++;
    switch (e.type()) {
    case simdjson::dom::element_type::OBJECT:
        for (auto field : simdjson::dom::object(e)) {
            events += field.key.size() > 0;
            dom_walk(field.value);
        }
        break;
    case simdjson::dom::element_type::ARRAY:
        for (auto v : simdjson::dom::array(e))
            dom_walk(v);
        break;
    case simdjson::dom::element_type::STRING:
        events += std::string_view(e).size() > 0;
        break;
    default: // numbers, literals: parsed onto the tape already
        break;
    }
}

bool dom_parse(simdjson::dom::parser &p, const padbuf &in)
{
    simdjson::dom::element root;
    if (p.parse(in.b.data(), in.len, false).get(root) != SUCCESS)
        return false;
    dom_walk(root);
    return true;
}

// ---- on demand ---------------------------------------------------------------

// Every value under v to its end: what yajl's tokenizer checks.
error_code od_walk(od::value v)
{
    od::json_type t;
    error_code e = v.type().get(t);
    if (e)
        return e;
    events++;
    switch (t) {
    case od::json_type::object: {
        od::object o;
        if ((e = v.get_object().get(o)))
            return e;
        for (auto f : o) {
            std::string_view k;
            if ((e = f.unescaped_key().get(k)))
                return e;
            od::value fv;
            if ((e = f.value().get(fv)) || (e = od_walk(fv)))
                return e;
        }
        return SUCCESS;
    }
    case od::json_type::array: {
        od::array a;
        if ((e = v.get_array().get(a)))
            return e;
        for (auto el : a) {
            od::value ev;
            if ((e = el.get(ev)) || (e = od_walk(ev)))
                return e;
        }
        return SUCCESS;
    }
    case od::json_type::number: {
        od::number n;
        return v.get_number().get(n);
    }
    case od::json_type::string: {
        std::string_view s;
        return v.get_string().get(s);
    }
    case od::json_type::boolean: {
        bool b;
        return v.get_bool().get(b);
    }
    case od::json_type::null: {
        bool isnull;
        if ((e = v.is_null().get(isnull)))
            return e;
        return isnull ? SUCCESS : simdjson::N_ATOM_ERROR;
    }
    }
    return simdjson::INCORRECT_TYPE;
}

// What a read keeps (body_scan.c's facts, much reduced: it is the reads that
// cost, not where they go).
struct facts {
    std::string_view model;
    int64_t max_tokens = -1, n = -1, pt = -1, ct = -1;
    bool stream = false, include_usage = false;
    size_t nmsgs = 0, nparts = 0, kinds = 0;
};

// A value nothing is read from: walked (od) or skipped (od-skip: nothing to
// do, the iterator steps over it when the next field is asked for).
template <bool Walk> error_code od_other(od::value v)
{
    if (Walk)
        return od_walk(v);
    return SUCCESS;
}

// A value whose kind only is read (tools, tool_calls).
template <bool Walk> error_code od_kind(od::value v, facts &fx)
{
    od::json_type t;
    error_code e = v.type().get(t);
    if (e)
        return e;
    fx.kinds += static_cast<size_t>(t);
    return od_other<Walk>(v);
}

template <bool Walk> error_code od_part(od::value v, facts &fx)
{
    od::object o;
    error_code e = v.get_object().get(o);
    if (e)
        return e;
    fx.nparts++;
    for (auto f : o) {
        std::string_view k, s;
        od::value fv;
        if ((e = f.unescaped_key().get(k)) || (e = f.value().get(fv)))
            return e;
        if (k == "type" || k == "text") {
            if ((e = fv.get_string().get(s)))
                return e;
            events += s.size();
        } else if (k == "image_url") {
            if ((e = od_kind<Walk>(fv, fx)))
                return e;
        } else if ((e = od_other<Walk>(fv))) {
            return e;
        }
    }
    return SUCCESS;
}

template <bool Walk> error_code od_message(od::value v, facts &fx)
{
    od::object o;
    error_code e = v.get_object().get(o);
    if (e)
        return e;
    fx.nmsgs++;
    for (auto f : o) {
        std::string_view k, s;
        od::value fv;
        if ((e = f.unescaped_key().get(k)) || (e = f.value().get(fv)))
            return e;
        if (k == "role" || k == "name") {
            if ((e = fv.get_string().get(s)))
                return e;
            events += s.size();
        } else if (k == "content") {
            od::json_type t;
            if ((e = fv.type().get(t)))
                return e;
            if (t == od::json_type::string) {
                if ((e = fv.get_string().get(s)))
                    return e;
                events += s.size();
            } else if (t == od::json_type::array) {
                od::array a;
                if ((e = fv.get_array().get(a)))
                    return e;
                for (auto el : a) {
                    od::value pv;
                    if ((e = el.get(pv)) || (e = od_part<Walk>(pv, fx)))
                        return e;
                }
            } else if ((e = od_other<Walk>(fv))) {
                return e;
            }
        } else if (k == "tool_calls") {
            if ((e = od_kind<Walk>(fv, fx)))
                return e;
        } else if ((e = od_other<Walk>(fv))) {
            return e;
        }
    }
    return SUCCESS;
}

// Nothing after the document: current_location() is OUT_OF_BOUNDS at its end.
error_code od_end(od::document &doc)
{
    const char *at;
    error_code e = doc.current_location().get(at);
    return e == simdjson::OUT_OF_BOUNDS ? SUCCESS : simdjson::TRAILING_CONTENT;
}

template <bool Walk> error_code od_chat(od::parser &p, const padbuf &in, facts &fx)
{
    od::document doc;
    error_code e = p.iterate(in.b.data(), in.len, in.b.size()).get(doc);
    if (e)
        return e;
    od::object top;
    if ((e = doc.get_object().get(top)))
        return e;
    for (auto f : top) {
        std::string_view k;
        od::value v;
        if ((e = f.unescaped_key().get(k)) || (e = f.value().get(v)))
            return e;
        if (k == "model") {
            e = v.get_string().get(fx.model);
        } else if (k == "max_tokens" || k == "max_completion_tokens" || k == "max_output_tokens") {
            e = v.get_int64().get(fx.max_tokens);
        } else if (k == "n") {
            e = v.get_int64().get(fx.n);
        } else if (k == "stream") {
            e = v.get_bool().get(fx.stream);
        } else if (k == "stream_options") {
            od::object so;
            if ((e = v.get_object().get(so)))
                return e;
            for (auto sf : so) {
                std::string_view sk;
                od::value sv;
                if ((e = sf.unescaped_key().get(sk)) || (e = sf.value().get(sv)))
                    return e;
                e = sk == "include_usage" ? sv.get_bool().get(fx.include_usage)
                                          : od_other<Walk>(sv);
                if (e)
                    return e;
            }
        } else if (k == "messages") {
            od::array a;
            if ((e = v.get_array().get(a)))
                return e;
            for (auto el : a) {
                od::value mv;
                if ((e = el.get(mv)) || (e = od_message<Walk>(mv, fx)))
                    return e;
            }
        } else if (k == "tools") {
            e = od_kind<Walk>(v, fx);
        } else {
            e = od_other<Walk>(v);
        }
        if (e)
            return e;
    }
    return Walk ? od_end(doc) : SUCCESS;
}

// The answer's usage object: its two counts, as gw_llm_usage_bytes keeps them.
template <bool Walk> error_code od_usage(od::parser &p, const padbuf &in, facts &fx)
{
    od::document doc;
    error_code e = p.iterate(in.b.data(), in.len, in.b.size()).get(doc);
    if (e)
        return e;
    od::object top;
    if ((e = doc.get_object().get(top)))
        return e;
    for (auto f : top) {
        std::string_view k;
        od::value v;
        if ((e = f.unescaped_key().get(k)) || (e = f.value().get(v)))
            return e;
        if (k == "prompt_tokens")
            e = v.get_int64().get(fx.pt);
        else if (k == "completion_tokens")
            e = v.get_int64().get(fx.ct);
        else
            e = od_other<Walk>(v);
        if (e)
            return e;
    }
    return Walk ? od_end(doc) : SUCCESS;
}

// ---- the modes -----------------------------------------------------------------

int info()
{
    std::printf("active %s (%s)\n", simdjson::get_active_implementation()->name().c_str(),
                simdjson::get_active_implementation()->description().c_str());
    // the macro, not builtin_implementation(): that one is the library's
    std::printf("builtin %s (On-Demand's stage 2 in this binary, fixed at compile time)\n",
                SJ_STR(SIMDJSON_BUILTIN_IMPLEMENTATION));
    std::printf("available:");
    for (auto impl : simdjson::get_available_implementations())
        if (impl->supported_by_runtime_system())
            std::printf(" %s", impl->name().c_str());
    std::printf("\n");
    return 0;
}

// One row of check(): whether each mode takes b.
void check_row(const char *b, simdjson::dom::parser &dp, od::parser &op)
{
    padbuf in;
    in.fill(b);
    simdjson::dom::element root;
    error_code de = dp.parse(in.b.data(), in.len, false).get(root);
    if (!de)
        dom_walk(root);
    facts f1, f2;
    error_code we = od_chat<true>(op, in, f1);
    error_code se = od_chat<false>(op, in, f2);
    std::string shown;
    for (const char *c = b; *c; c++) {
        unsigned char u = static_cast<unsigned char>(*c);
        if (u >= 0x80) {
            shown += "\\x";
            shown += "0123456789abcdef"[u >> 4];
            shown += "0123456789abcdef"[u & 15];
        } else {
            shown += *c;
        }
    }
    std::printf("| `%s` | %s | %s | %s |\n", shown.c_str(), de ? "refused" : "taken",
                we ? "refused" : "taken", se ? "refused" : "taken");
}

// Inputs sluice refuses today (yajl or body_scan.c's checks, or jansson on
// the slow path), then inputs it takes (jansson takes them).
int check()
{
    static const char *const bad[] = {
        "{\"model\":\"m\",\"x\":[1,,2],\"messages\":[]}",
        "{\"model\":\"m\",\"x\":tru,\"messages\":[]}",
        "{\"model\":\"m\",\"x\":01,\"messages\":[]}",
        "{\"model\":\"m\",\"x\":1.e5,\"messages\":[]}",
        "{\"model\":\"m\",\"x\":{\"a\" \"b\"},\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"\\q\",\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"\\ud800\",\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"\xc3\x28\",\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"\xed\xa0\x80\",\"messages\":[]}",
        "{\"model\":\"m\",\"x\":[1,2}],\"messages\":[]}",
        "{\"model\":\"m\",\"messages\":[]} {}",
        "{\"model\":\"m\",\"messages\":[]}}",
        "{\"model\":\"m\",\"model\":\"n\",\"messages\":[]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"x\":nul}]}",
    };
    static const char *const good[] = {
        "{\"model\":\"m\",\"x\":18446744073709551616,\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"a\\u0000b\",\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"\\ud83d\\ude00\",\"messages\":[]}",
    };
    simdjson::dom::parser dp;
    od::parser op;
    std::printf("Refused by sluice today:\n\n| input | dom | od (walk) | od-skip |\n"
                "| --- | --- | --- | --- |\n");
    for (const char *b : bad)
        check_row(b, dp, op);
    std::printf("\nTaken by sluice today (jansson's acceptance):\n\n| input | dom | od (walk) | "
                "od-skip |\n| --- | --- | --- | --- |\n");
    for (const char *b : good)
        check_row(b, dp, op);
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    if (argc >= 2 && std::strcmp(argv[1], "info") == 0)
        return info();
    if (argc >= 2 && std::strcmp(argv[1], "check") == 0)
        return check();
    if (argc < 4)
        return 2;
    const char *mode = argv[1];
    std::string src = slurp(argv[2]);
    long n = std::atol(argv[3]);
    bool usage = argc > 4 && std::strcmp(argv[4], "usage") == 0;
    if (src.empty())
        return 2;
    padbuf in;
    simdjson::dom::parser dp;
    od::parser op;
    facts fx;
    bool dom = std::strcmp(mode, "dom") == 0, walk = std::strcmp(mode, "od") == 0;
    if (!dom && !walk && std::strcmp(mode, "od-skip") != 0)
        return 2;
    for (long i = 0; i < n; i++) {
        in.fill(src);
        bool ok;
        if (dom)
            ok = dom_parse(dp, in);
        else if (usage)
            ok = (walk ? od_usage<true>(op, in, fx) : od_usage<false>(op, in, fx)) == SUCCESS;
        else
            ok = (walk ? od_chat<true>(op, in, fx) : od_chat<false>(op, in, fx)) == SUCCESS;
        if (!ok) {
            std::fprintf(stderr, "%s: parse failed\n", mode);
            return 1;
        }
    }
    std::printf("simdjson %s %lu msgs %zu parts %zu pt %lld ct %lld\n", mode, events, fx.nmsgs,
                fx.nparts, static_cast<long long>(fx.pt), static_cast<long long>(fx.ct));
    return 0;
}
