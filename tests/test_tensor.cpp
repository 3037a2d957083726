#include <gtest/gtest.h>

#include "core/tensor.h"

using namespace st;

TEST(Tensor, ViewsShareStorageAndCheckBounds) {
  Tensor t = Tensor::empty({3, 4, 5}, DType::F32);
  float* p = t.data<float>();
  for (int i = 0; i < 60; ++i) p[i] = static_cast<float>(i);
  Tensor row = t[1];
  EXPECT_EQ(row.shape(), (Shape{4, 5}));
  EXPECT_EQ(row.data<float>()[0], 20.0f);
  Tensor sl = t.slice(1, 3);
  EXPECT_EQ(sl.shape(), (Shape{2, 4, 5}));
  EXPECT_EQ(sl.data<float>()[39], 59.0f);
  Tensor fl = t.flat(7, 6, {2, 3});
  EXPECT_EQ(fl.data<float>()[5], 12.0f);
  fl.data<float>()[0] = -1.0f;
  EXPECT_EQ(p[7], -1.0f);
  EXPECT_THROW(t.slice(2, 4), Error);
  EXPECT_THROW(t.flat(55, 6, {6}), Error);
  EXPECT_THROW(t.view({7, 7}), Error);
  EXPECT_THROW(t.data<double>(), Error);
}

TEST(Tensor, ZerosAndDescribe) {
  Tensor z = Tensor::zeros({2, 3}, DType::F64);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(z.data<double>()[i], 0.0);
  EXPECT_EQ(z.desc(), "fp64[2, 3] cpu");
  EXPECT_THROW(check_shape(z, {3, 2}, "z"), Error);
}
