#include "report/html.h"

#include <string>

#include "gtest/gtest.h"

namespace spikeguard::report {
namespace {

TEST(HtmlEscapeTest, MarkupAndQuotesBecomeEntities) {
  EXPECT_EQ(HtmlEscape("<script>alert('x')</script>"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;");
  EXPECT_EQ(HtmlEscape("a\"b&c"), "a&quot;b&amp;c");
  EXPECT_EQ(HtmlEscape("\" onload=\"x"), "&quot; onload=&quot;x");
}

TEST(HtmlEscapeTest, InvalidUtf8AndControlBytesBecomeReplacementCharacters) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(HtmlEscape(std::string("a\0b", 3)), "a" + fffd + "b");
  EXPECT_EQ(HtmlEscape("\xff\xfe"), fffd + fffd);
  EXPECT_EQ(HtmlEscape("\xC0\xBC"), fffd + fffd);          // overlong '<'
  EXPECT_EQ(HtmlEscape("\xED\xA0\x80"), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(HtmlEscape("\xE2\x82"), fffd + fffd);          // cut sequence
  EXPECT_EQ(HtmlEscape("\x1b[31m"), fffd + "[31m");
  // Valid UTF-8, tab and newline stay.
  EXPECT_EQ(HtmlEscape("h\xC3\xA9llo \xE2\x88\x9E\t\n"), "h\xC3\xA9llo \xE2\x88\x9E\t\n");
}

TEST(BytePreviewTest, ShowsBinaryAsHexAndCuts) {
  EXPECT_EQ(BytePreview(std::string("ab\0\xff\n<", 6)), "ab\\x00\\xff\\n<");
  EXPECT_EQ(BytePreview("abcdef", 3), "abc\xE2\x80\xA6");
  // The preview is plain text: escaping it leaves no markup.
  EXPECT_EQ(HtmlEscape(BytePreview("<b>\x80")), "&lt;b&gt;\\x80");
}

}  // namespace
}  // namespace spikeguard::report
