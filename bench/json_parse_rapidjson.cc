// json_parse_rapidjson.cc — bench/json_parse.c's count for RapidJSON's SAX
// reader (Debian's rapidjson-dev, header-only C++), run by json_parse.sh
// when installed: a handler that does nothing, numbers as strings (as yajl's
// number callback), with and without its UTF-8 validation.
//
//   json_parse_rapidjson MODE N [FILE]    MODE: utf8 | plain; N parses of FILE
//                                         (default: #16's body)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include <rapidjson/reader.h>

namespace
{

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

template <unsigned F> bool parse(rapidjson::Reader &r, Counter &h, const char *in)
{
    rapidjson::StringStream ss(in);
    return !r.Parse<F | rapidjson::kParseNumbersAsStringsFlag | rapidjson::kParseStopWhenDoneFlag>(
                 ss, h)
                .IsError();
}

} // namespace

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4)
        return 2;
    bool utf8 = std::strcmp(argv[1], "utf8") == 0;
    long n = std::atol(argv[2]);
    std::string file;
    if (argc == 4) {
        std::ifstream f(argv[3], std::ios::binary);
        file.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
        if (file.empty())
            return 2;
    }
    const char *in = argc == 4 ? file.c_str() : body; // NUL-terminated either way
    rapidjson::Reader r;
    Counter h;
    for (long i = 0; i < n; i++)
        if (!(utf8 ? parse<rapidjson::kParseValidateEncodingFlag>(r, h, in) : parse<0>(r, h, in)))
            return 1;
    std::printf("rapidjson %lu\n", h.events);
    return 0;
}
