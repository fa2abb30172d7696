// The corpus of the GPT example's tests: ~1,500 bytes of fortune-like text,
// 24 cookies, so a validation split of 2 (every 20th cookie is held out).
#pragma once

#include <string>

inline std::string gpt_test_text() {
  const char* lines[] = {"The early bird gets the worm.", "A journey of a thousand miles begins with one step.",
                         "Look before you leap.", "Every cloud has a silver lining.",
                         "Actions speak louder than words.", "Better late than never.",
                         "The pen is mightier than the sword.", "When in Rome, do as the Romans do."};
  std::string out;
  for (int i = 0; i < 24; ++i) out += std::string(lines[i % 8]) + "\n\t-- proverb " + std::to_string(i) + "\n%\n";
  return out;
}
