// json_parse_rapidjson.cc — bench/json_parse.c's count for RapidJSON's SAX
// reader (Debian's rapidjson-dev, header-only C++), run by json_parse.sh
// when installed: a handler that does nothing, numbers as strings (as yajl's
// number callback), with and without its UTF-8 validation.
//
//   json_parse_rapidjson MODE N    MODE: utf8 | plain; N parses
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <rapidjson/reader.h>

namespace {

const char body[] =
    "{\"model\":\"chat-model\",\"messages\":[{\"role\":\"system\",\"content\":\"You are a "
    "helpful assistant.\"},{\"role\":\"user\",\"content\":\"Write one sentence about the sea, "
    "please, in plain English.\"}],\"max_tokens\":64}";

struct Counter : rapidjson::BaseReaderHandler<rapidjson::UTF8<>, Counter> {
    unsigned long events = 0;
    bool Default()
    {
        events++;
        return true;
    }
};

template <unsigned F> bool parse(rapidjson::Reader &r, Counter &h)
{
    rapidjson::StringStream ss(body);
    return !r.Parse<F | rapidjson::kParseNumbersAsStringsFlag | rapidjson::kParseStopWhenDoneFlag>(
                 ss, h)
                .IsError();
}

} // namespace

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    bool utf8 = std::strcmp(argv[1], "utf8") == 0;
    long n = std::atol(argv[2]);
    rapidjson::Reader r;
    Counter h;
    for (long i = 0; i < n; i++)
        if (!(utf8 ? parse<rapidjson::kParseValidateEncodingFlag>(r, h) : parse<0>(r, h)))
            return 1;
    std::printf("rapidjson %lu\n", h.events);
    return 0;
}
