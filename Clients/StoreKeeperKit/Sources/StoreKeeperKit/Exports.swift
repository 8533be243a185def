// `import StoreKeeperKit` is all an app writes: the core's types (PurchaseCoordinator,
// HTTPBackend, CustomerInfo…) come with it.
@_exported import StoreKeeperKitCore
