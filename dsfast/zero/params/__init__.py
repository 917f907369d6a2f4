"""ZeRO stage 3's partitioned parameters: records, gathers, module hooks, zero.Init, GatheredParameters."""
