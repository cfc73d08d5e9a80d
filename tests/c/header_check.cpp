// header_check.cpp — cgru.h compiles as C++ (extern "C", no C-only constructs) and links.
//   c++ -std=c++11 -Wall -Wextra -Werror -pedantic header_check.cpp
//       $(python -m cgru --cflags --libs)
#include <cstdio>
#include <cstring>

#include "cgru.h"

static_assert(CGRU_VERSION == CGRU_VERSION_MAJOR * 10000 + CGRU_VERSION_MINOR * 100 +
                                  CGRU_VERSION_PATCH, "CGRU_VERSION packs MAJOR.MINOR.PATCH");
static_assert(CGRU_STATUS_SUCCESS == 0, "success is 0");

int main()
{
    cgru_rnn_desc_t desc;
    if (cgru_rnn_desc_init(&desc) != CGRU_STATUS_SUCCESS || desc.num_layers != 1 ||
        desc.reset_after != 1 || desc.data_type != CGRU_DATA_FLOAT)
        return 1;
    if (cgru_get_version() != CGRU_VERSION)
        return 2;
    if (std::strcmp(cgru_get_error_string(CGRU_STATUS_BUFFER_TOO_SMALL),
                    "CGRU_STATUS_BUFFER_TOO_SMALL") != 0)
        return 3;
    if (cgru_rnn_desc_init(nullptr) != CGRU_STATUS_BAD_PARAM ||
        std::strlen(cgru_get_last_error_message()) == 0)
        return 4;
    std::printf("C++: cgru %d.%d.%d\n", CGRU_VERSION_MAJOR, CGRU_VERSION_MINOR,
                CGRU_VERSION_PATCH);
    return 0;
}
